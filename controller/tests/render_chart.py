"""Renders the knic chart with Helm's own engine (PyPI helm-python-sdk) for the chart tests.

usage: render_chart.py CHART_DIR NAMESPACE VALUES_JSON

Prints {"template path": "rendered manifest", ...} as JSON.
"""

import json
import sys

import helm_python as helm


def main():
    chart_dir, namespace, values = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    chart = helm.Chart.load(chart_dir)
    rendered = chart.render(values, name="knic", namespace=namespace, is_install=True)
    print(json.dumps(rendered))


if __name__ == "__main__":
    main()
