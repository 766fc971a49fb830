"""specpilot.controller"""
