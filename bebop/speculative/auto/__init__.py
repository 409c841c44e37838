"""``--mode auto`` / ``--speculate-k auto``: the wing that picks a (mode, K) for a call (docs/auto.md).

``acceptance`` and ``costs`` are the models, ``tail`` prices a call's lockstep tail, ``chooser``
decides and owns the probe schedule, ``generate`` runs a call that probes and switches, ``profile``
carries a chooser across ``bebop generate`` calls.
"""
