"""Beyond one model and one machine (DESIGN.md section 6b): plans of many models, the executors that run them, and the
deployment manifests (KServe, Kubernetes) written beside the report."""
