"""Audio as callers hand it over: WAV files and streams resampled as one."""
