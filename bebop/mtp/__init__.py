"""The MTP draft head (``MtpHead``), its training (``train_mtp``) and exact evaluation (``evaluate_mtp``)."""

from bebop.mtp.head import MtpConfig, MtpHead

__all__ = ["MtpConfig", "MtpHead"]
