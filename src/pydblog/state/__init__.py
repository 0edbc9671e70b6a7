"""State store backends. The embedded default is ``FileStateStore``."""
