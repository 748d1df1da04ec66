"""Beyond one machine: render what Slurm and Kubernetes take, from the same options as ``torchrig launch``.

torchrig does not invent a cluster manager. ``torchrig cluster slurm`` renders an sbatch script in which
``srun`` starts one ``torchrig launch`` per node (torchrun underneath, c10d rendezvous on the first node);
``torchrig cluster k8s`` renders Kubernetes manifests (a Kubeflow Training Operator ``PyTorchJob``, a
SIG-Apps ``JobSet``, or a plain indexed ``Job`` with a headless ``Service`` for clusters with neither). Renders are pure
functions of a :class:`~torchrig.cluster.job.ClusterJob`; validation and submission are separate steps.
"""

from torchrig.cluster.job import ClusterJob, ContainerRuntime, K8sKind

__all__ = ["ClusterJob", "ContainerRuntime", "K8sKind"]
