"""Beyond one model and one machine: plans of many models, the executors that run them, and the
deployment manifests (KServe, Kubernetes) written beside the report."""
