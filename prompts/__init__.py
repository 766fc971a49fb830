"""specpilot.prompts"""
