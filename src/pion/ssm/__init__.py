"""Recurrent state (``SSM.PREFIX.*``): the opaque per-layer state of recurrent and hybrid
models after a prefix (docs/attention.md, "Recurrent state").

Not attention: a Mamba or RWKV layer has no per-token K/V to attend over, only one
fixed-size state, so the server keeps the client's bytes and never parses them.
Reading order: one module, ``store.py`` (the blobs, their memory bound and their mutations for the
write-ahead log). The commands are ``pion.commands.ssm``; durability is
``pion.persistence.ssm_durable``.

Imports only ``errors``.
"""

from __future__ import annotations

from pion.ssm.store import MAX_SSM_LAYER, SsmDrop, SsmJournal, SsmMutation, SsmStore, SsmWrite

__all__ = [
    "MAX_SSM_LAYER",
    "SsmDrop",
    "SsmJournal",
    "SsmMutation",
    "SsmStore",
    "SsmWrite",
]
