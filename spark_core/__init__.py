"""spark_core"""
