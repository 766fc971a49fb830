"""specpilot.orchestrator"""
