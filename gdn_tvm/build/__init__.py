"""Apply schedules, compile, export."""
