"""What a trace shows, drawn in one place: the peak, bands over time, charts as data and their SVG,
PNG and HTML renderings.
"""
