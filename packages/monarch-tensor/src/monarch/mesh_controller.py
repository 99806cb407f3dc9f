"""Upstream's ``monarch.mesh_controller``, by name: the tensor engine's ``RemoteException``
(``except monarch.mesh_controller.RemoteException:`` in upstream code keeps working)."""

from monarch.tensor import RemoteException

__all__ = ["RemoteException"]
