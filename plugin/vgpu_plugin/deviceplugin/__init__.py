"""The node daemon: kubelet device plugin v1beta1 for vcuda-core / vcuda-memory, health,
node annotation publisher, and the in-process metrics server."""
