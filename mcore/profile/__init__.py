"""Where the time goes: profiling, attribution, the profile file and its views, device facts."""
