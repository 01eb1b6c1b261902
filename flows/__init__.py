"""The lifecycle as Prefect flows, one module per stage, readable top to bottom like a runbook.

configure, certify, operate and onboard land here (docs/design/architecture.md); each calls the core in ``gpucert/``,
which never imports Prefect.
"""
