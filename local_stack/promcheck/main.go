// promcheck reads Prometheus alert rules and Grafana dashboards with Prometheus's own
// code: each rules file as Prometheus loads it (model/rulefmt: groups, durations,
// label names, annotation templates, every expr through the PromQL parser), each
// dashboard's queries (panel targets, query variables) through the PromQL parser,
// Grafana's variables replaced by values of their kind. One line per problem; exit
// status 1 when any. Built by `shorelink stack install` (local_stack/tools.py) from
// the Go module proxy; tests/test_monitoring.py runs it over deploy/.
//
//	promcheck deploy/prometheus/shorelink-alerts.yml deploy/grafana/dashboards/*.json
package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

var (
	durationVar = regexp.MustCompile(`\$\{?__(rate_interval|interval|range)\}?`)
	otherVar    = regexp.MustCompile(`\$\{?\w+\}?`)
	labelValues = regexp.MustCompile(`(?s)^\s*(?:label_values\((.*),\s*\w+\s*\)|query_result\((.*)\))\s*$`)
)

type panel struct {
	Title   string  `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

type dashboard struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

func main() {
	pq := parser.NewParser(parser.Options{})
	problems, checked := 0, 0
	report := func(format string, args ...any) {
		fmt.Printf(format+"\n", args...)
		problems++
	}
	parse := func(file, where, expr string) {
		expr = durationVar.ReplaceAllString(expr, "5m")
		expr = otherVar.ReplaceAllString(expr, ".+")
		checked++
		if _, err := pq.ParseExpr(expr); err != nil {
			report("%s: %s: %v", file, where, err)
		}
	}
	var walk func(file string, ps []panel)
	walk = func(file string, ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				parse(file, "panel "+p.Title, t.Expr)
			}
			walk(file, p.Panels)
		}
	}
	for _, file := range os.Args[1:] {
		switch {
		case strings.HasSuffix(file, ".yml") || strings.HasSuffix(file, ".yaml"):
			groups, errs := rulefmt.ParseFile(file, false, model.UTF8Validation, pq, slog.Default())
			for _, err := range errs {
				report("%v", err)
			}
			if groups != nil {
				for _, g := range groups.Groups {
					checked += len(g.Rules)
				}
			}
		case strings.HasSuffix(file, ".json"):
			raw, err := os.ReadFile(file)
			if err != nil {
				report("%v", err)
				continue
			}
			var d dashboard
			if err := json.Unmarshal(raw, &d); err != nil {
				report("%s: %v", file, err)
				continue
			}
			walk(file, d.Panels)
			for _, v := range d.Templating.List {
				if v.Type != "query" {
					continue
				}
				var q struct {
					Query string `json:"query"`
				}
				if json.Unmarshal(v.Query, &q) != nil {
					_ = json.Unmarshal(v.Query, &q.Query) // a plain string
				}
				if m := labelValues.FindStringSubmatch(q.Query); m != nil {
					parse(file, "variable "+v.Name, m[1]+m[2])
				}
			}
		default:
			report("%s: neither rules (.yml) nor a dashboard (.json)", file)
		}
	}
	fmt.Printf("checked %d rules and queries, %d problems\n", checked, problems)
	if problems > 0 {
		os.Exit(1)
	}
}
