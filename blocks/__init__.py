"""Prefect blocks: GpuCluster, BaselineStore, Ticketing and CertificationPolicy (DESIGN.md, "Prefect").

CertificationPolicy will carry the same policy as ``gpucert.policy.Policy`` (the YAML defaults in
``gpucert/data/policy.yaml``), so the UI and the command line judge with one set of thresholds."""
