"""specpilot.memory_store"""
