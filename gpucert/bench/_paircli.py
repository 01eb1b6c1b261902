"""The pair unit's command line, under the module path it had before the node and pair units shared one:
:mod:`gpucert.bench._cli` holds both. Kept only for ``gpucert.certify._pairjobs`` and
``gpucert.sim._benchlogs``, which import :func:`check_pair_args` from here; remove once they import it
from ``._cli``."""

from ._cli import check_pair_args, parse_pair_args

__all__ = ["check_pair_args", "parse_pair_args"]
