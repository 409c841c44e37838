"""The MTP draft head (``MtpHead``), its training (``train_mtp``) and exact evaluation (``evaluate_mtp``)."""


def __getattr__(name: str):
    """``MtpConfig`` and ``MtpHead`` load torch: imported on first use, so ``bebop.mtp.config`` (train-mtp's
    flags) stays light for ``bebop --help``."""
    if name in ("MtpConfig", "MtpHead"):
        from bebop.mtp import head

        return getattr(head, name)
    raise AttributeError(f"module 'bebop.mtp' has no attribute {name!r}")


__all__ = ["MtpConfig", "MtpHead"]
