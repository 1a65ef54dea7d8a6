"""``Stateful``: anything with ``state_dict()`` and ``load_state_dict(sd)`` (a module, an
optimizer, a class of the user's) that ``save`` turns into its state dict first and
``load`` fills in place and hands back."""
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = ["Stateful", "StatefulT"]


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]:
        """The state to checkpoint; ``load`` calls it too, to get the tensors it fills."""
        ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take back the state (as :meth:`state_dict` returned it, filled by ``load``)."""
        ...


StatefulT = TypeVar("StatefulT", bound=Stateful)
