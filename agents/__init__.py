"""specpilot.agents"""
