"""The running capture as the API reads it: ``capture.live`` (the capture owns and
updates ``LIVE``; the API only reads it, through ``ports.RunnerView``)."""

from pydblog.capture.live import LIVE, LiveCapture

__all__ = ["LIVE", "LiveCapture"]
