"""Hidden-state heads (treespec.heads): the MTP module in the Qwen layout and
EAGLE-3 heads in the speculators format, loaded from the zoo's seeded
checkpoints and the built-in pair's trained heads.

Pinned here: every layout loads through ``--draft-head``'s one path; a head
that does not fit its target is refused with the flag and the reason, before
anything is built; a head's forward equals a recomputation from the files'
raw tensors (plain mx ops and mlx-lm's own layer classes); a head shares the
target's embedding and output head and changes none of the target's arrays;
a reduced draft vocabulary maps back to target ids as ``d + d2t[d]``.
"""
