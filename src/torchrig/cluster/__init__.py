"""Beyond one machine: render what Slurm and Kubernetes take, from the same options as ``torchrig launch``.

torchrig does not invent a cluster manager. ``torchrig cluster slurm`` renders an sbatch script in which
``srun`` starts one ``torchrig launch`` per node (torchrun underneath, c10d rendezvous on the first node);
``torchrig cluster k8s`` renders Kubernetes manifests (a Kubeflow Training Operator ``PyTorchJob``, a
SIG-Apps ``JobSet``, or a plain indexed ``Job`` with a headless ``Service`` for clusters with neither). Renders are pure
functions of a :class:`~torchrig.cluster.job.ClusterJob`; validation and submission are separate steps.
Every field is checked where it enters (:mod:`torchrig.cluster.fields`), and literal text reaches bash only
through ``shlex.quote`` and the kubelet only as ``command``/``args`` with ``$`` escaped, so no input becomes
code on a node. ``--submit --wait`` follows a Slurm job to its end through ``scontrol``
(:mod:`torchrig.cluster.slurmjob`).
"""

from torchrig.cluster.job import ClusterJob, ContainerRuntime, K8sKind

__all__ = ["ClusterJob", "ContainerRuntime", "K8sKind"]
