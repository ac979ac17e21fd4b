"""kube-scheduler extender: filter, prioritize and bind vGPU pods over HTTP (see server.Extender)."""
