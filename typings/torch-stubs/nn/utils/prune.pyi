"""Typed stub of ``torch.nn.utils.prune`` (torch 2.x), for mypy.

torch ships this module without annotations (``# mypy: allow-untyped-defs``).
These are its public classes and functions and the underscore helpers that
``funcprune.compat`` re-exports, with the parameter names, kinds and defaults
of the installed source (``tests/compat/test_stub.py`` compares them); the
types are those its docstrings and code accept.

Layout: a PEP 561 *partial* stub package (``torch-stubs/`` with a ``py.typed``
that reads ``partial``), so that every other ``torch`` module resolves to
torch's own typed sources. mypy looks for stub packages on the interpreter's
search path only, never on ``mypy_path`` (a ``typings/torch/nn/utils/prune.pyi``
is skipped because ``typings/torch`` has no ``__init__.pyi``, and adding one
would hide the whole of torch); run mypy with ``PYTHONPATH=typings`` to use it.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, overload

from torch import Tensor
from torch.nn import Module

_M = TypeVar("_M", bound=Module)

class BasePruningMethod(ABC):
    _tensor_name: str
    def __call__(self, module: Module, inputs: Any) -> None: ...
    @abstractmethod
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor: ...
    def apply_mask(self, module: Module) -> Tensor: ...
    @classmethod
    def apply(
        cls,
        module: Module,
        name: str,
        *args: Any,
        importance_scores: Tensor | None = None,
        **kwargs: Any,
    ) -> BasePruningMethod: ...
    def prune(
        self,
        t: Tensor,
        default_mask: Tensor | None = None,
        importance_scores: Tensor | None = None,
    ) -> Tensor: ...
    def remove(self, module: Module) -> None: ...

class PruningContainer(BasePruningMethod):
    _pruning_methods: tuple[BasePruningMethod, ...]
    def __init__(self, *args: BasePruningMethod) -> None: ...
    def add_pruning_method(self, method: BasePruningMethod | None) -> None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[BasePruningMethod]: ...
    @overload
    def __getitem__(self, idx: int) -> BasePruningMethod: ...
    @overload
    def __getitem__(self, idx: slice) -> tuple[BasePruningMethod, ...]: ...
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor: ...

class Identity(BasePruningMethod):
    PRUNING_TYPE: str
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor: ...
    @classmethod
    def apply(cls, module: Module, name: str) -> BasePruningMethod: ...  # type: ignore[override]

class RandomUnstructured(BasePruningMethod):
    PRUNING_TYPE: str
    amount: int | float
    def __init__(self, amount: int | float) -> None: ...
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor: ...
    @classmethod
    def apply(  # type: ignore[override]
        cls, module: Module, name: str, amount: int | float
    ) -> BasePruningMethod: ...

class L1Unstructured(BasePruningMethod):
    PRUNING_TYPE: str
    amount: int | float
    def __init__(self, amount: int | float) -> None: ...
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor: ...
    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: Module,
        name: str,
        amount: int | float,
        importance_scores: Tensor | None = None,
    ) -> BasePruningMethod: ...

class RandomStructured(BasePruningMethod):
    PRUNING_TYPE: str
    amount: int | float
    dim: int
    def __init__(self, amount: int | float, dim: int = -1) -> None: ...
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor: ...
    @classmethod
    def apply(  # type: ignore[override]
        cls, module: Module, name: str, amount: int | float, dim: int = -1
    ) -> BasePruningMethod: ...

class LnStructured(BasePruningMethod):
    PRUNING_TYPE: str
    amount: int | float
    n: int | float | str
    dim: int
    def __init__(self, amount: int | float, n: int | float | str, dim: int = -1) -> None: ...
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor: ...
    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: Module,
        name: str,
        amount: int | float,
        n: int | float | str,
        dim: int,
        importance_scores: Tensor | None = None,
    ) -> BasePruningMethod: ...

class CustomFromMask(BasePruningMethod):
    PRUNING_TYPE: str
    mask: Tensor
    def __init__(self, mask: Tensor) -> None: ...
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor: ...
    @classmethod
    def apply(  # type: ignore[override]
        cls, module: Module, name: str, mask: Tensor
    ) -> BasePruningMethod: ...

def identity(module: _M, name: str) -> _M: ...
def random_unstructured(module: _M, name: str, amount: int | float) -> _M: ...
def l1_unstructured(
    module: _M, name: str, amount: int | float, importance_scores: Tensor | None = None
) -> _M: ...
def random_structured(module: _M, name: str, amount: int | float, dim: int) -> _M: ...
def ln_structured(
    module: _M,
    name: str,
    amount: int | float,
    n: int | float | str,
    dim: int,
    importance_scores: Tensor | None = None,
) -> _M: ...
def global_unstructured(
    parameters: Iterable[tuple[Module, str]],
    pruning_method: Callable[..., BasePruningMethod],
    importance_scores: dict[tuple[Module, str], Tensor] | None = None,
    **kwargs: Any,
) -> None: ...
def custom_from_mask(module: _M, name: str, mask: Tensor) -> _M: ...
def remove(module: _M, name: str) -> _M: ...
def is_pruned(module: Module) -> bool: ...
def _validate_pruning_amount_init(amount: object) -> None: ...
def _validate_pruning_amount(amount: int | float, tensor_size: int) -> None: ...
def _validate_structured_pruning(t: Tensor) -> None: ...
def _compute_nparams_toprune(amount: int | float, tensor_size: int) -> int: ...
def _validate_pruning_dim(t: Tensor, dim: int) -> None: ...
def _compute_norm(t: Tensor, n: int | float | str, dim: int) -> Tensor: ...
