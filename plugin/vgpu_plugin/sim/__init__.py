"""Simulated cluster: the Kubernetes API (kmock + extensions), scheduler and kubelet stand-ins, demo."""
