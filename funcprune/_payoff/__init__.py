"""Masks that pay off: baked, shrunk and sparse models (the door).

``_bake.py`` zeroes pruned weights in a copy of a module; ``_biases.py``
gives a copy the biases FLAP's compensation adds (``with_biases``); ``_shrink.py``
removes the channels the masks prune entirely, following the channel
analysis of ``funcprune._graph``, building smaller copies (``_smaller.py``)
and verifying them against the masked model (``_verify.py``);
``_sparse.py`` turns masked Linear weights into CSR, BSR or 2:4 sparse
tensors, below the measured break-even sparsity (``_break_even.py``) with a
warning; ``_depth.py`` removes whole blocks the masks prune entirely (depth), of the stacks
``_stacks.py`` finds; ``_checks.py`` holds the argument checks they share; the
``_masks_*.py`` modules keep masks at rest, bit-packed: ``_masks_packed.py``
in memory, ``_masks_files.py`` in safetensors files (over the bits, DTensor
blocks' records, laying out, merging and the checks of untrusted records);
``_shards.py`` reads a checkpoint's safetensors shards a few tensors at a
time and writes new shards, laid out up front, a tensor at a time, with
their index (the streamed one-shot's).
``README.md`` has the design.
"""

from ._bake import bake as bake
from ._biases import with_biases as with_biases
from ._break_even import BSR_BREAK_EVEN as BSR_BREAK_EVEN
from ._break_even import CSR_BREAK_EVEN as CSR_BREAK_EVEN
from ._break_even import BreakEven as BreakEven
from ._break_even import SlowSparseWarning as SlowSparseWarning
from ._config import ShrunkConfigWarning as ShrunkConfigWarning
from ._config import is_transformers_model as is_transformers_model
from ._depth import blocks_of as blocks_of
from ._depth import depthless as depthless
from ._depth import describe_depth_ as describe_depth_
from ._depth import without_blocks as without_blocks
from ._hidden import hidden_of as hidden_of
from ._hidden import narrowed as narrowed
from ._kept import KeptChannelsWarning as KeptChannelsWarning
from ._masks_files import load_masks as load_masks
from ._masks_files import save_masks as save_masks
from ._masks_packed import pack_masks as pack_masks
from ._masks_packed import unpack_masks as unpack_masks
from ._probes import removable as removable
from ._reload import load_shrunk as load_shrunk
from ._shrink import propagate as propagate
from ._shrink import shrink as shrink
from ._sparse import to_sparse as to_sparse
from ._stacks import block_names as block_names
from ._stacks import stacks_of as stacks_of
from ._masks_files import PackedMasks as PackedMasks
from ._shards import ShardLayout as ShardLayout
from ._shards import Shards as Shards
from ._shards import size_in_bytes as size_in_bytes
