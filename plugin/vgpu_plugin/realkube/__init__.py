"""A real Kubernetes cluster on one machine, built from Kubernetes' own Go modules
(``hack/kube``), with jupyter-vgpu deployed on it: ``cluster.RealCluster``; behind
``jupyter-vgpu sim --control-plane real`` and the ``tests/realkube`` tier."""
