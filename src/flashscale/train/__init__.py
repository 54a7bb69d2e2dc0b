"""flashscale.train"""
