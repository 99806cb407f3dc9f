"""torchrun-style SPMD scripts on a mesh (upstream's ``monarch.spmd``). Not written yet."""

__all__: list[str] = []
