"""Charts as plain data (``chart``), drawn by matplotlib as SVG or PNG (``mpl``) or as an
interactive, self-contained HTML page with inline SVG and a little JavaScript (``html``)."""
