"""flashscale.data"""
