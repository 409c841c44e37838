"""``--mode auto`` / ``--speculate-k auto``: picks a (mode, K) for a call (docs/auto.md). ``acceptance``, ``costs``:
the models; ``tail``: a call's lockstep tail; ``chooser``: the decision and probe schedule; ``generate``: a call
that probes and switches; ``profile``: a chooser kept across ``bebop generate`` calls."""
