"""Experiments: specs checked and accepted, submissions, the listing, the model predictor, how a
finished one reads against its question.
"""
