"""Exact bottom-k selection, the one door (``README.md``: the three rules and the paths)."""

from ._blocks import block_norms as block_norms
from ._blocks import blocks_with_an_entry as blocks_with_an_entry
from ._blocks import expand_blocks as expand_blocks
from ._choose import FAST_MIN_KEYS as FAST_MIN_KEYS
from ._choose import SHARDED_BRACKET_MIN_KEYS as SHARDED_BRACKET_MIN_KEYS
from ._choose import eligible_per_group as eligible_per_group
from ._choose import keep as keep
from ._choose import keep_jointly as keep_jointly
from ._choose import resolve_count as resolve_count
from ._groups import WHOLE as WHOLE
from ._groups import Blocks as Blocks
from ._groups import CountOf as CountOf
from ._groups import Group as Group
from ._groups import KeyPart as KeyPart
from ._groups import LocalShard as LocalShard
from ._groups import Slices as Slices
from ._groups import Sparsity as Sparsity
from ._groups import Target as Target
from ._groups import Whole as Whole
from ._groups import magnitude_of as magnitude_of
from ._n_m import kept_n_m as kept_n_m
from ._sharded import Selection as Selection
from ._sharded import keep_over_shards_each as keep_over_shards_each
from ._sharded import processes as processes
from ._sharded import reduced_over as reduced_over
from ._sharded import sum_over_shards as sum_over_shards
