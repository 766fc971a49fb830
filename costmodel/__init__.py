"""specpilot.costmodel"""
