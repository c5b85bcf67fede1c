"""core_gateway"""
