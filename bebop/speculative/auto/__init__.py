"""``--mode auto`` / ``--speculate-k auto``: the wing that picks a (mode, K) for a call.

``chooser`` models acceptance and step costs and predicts tokens/s; ``tail`` prices a call's
lockstep tail; ``replay`` replays each K's acceptance where its own steps would start; ``profile``
carries a chooser's state across ``bebop generate`` calls.
"""
