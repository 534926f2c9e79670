"""(the map of this package is written in the next commit)"""
