package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

var (
	codeSpan = regexp.MustCompile("`([^`]+)`")
	arrow    = regexp.MustCompile(`^\s*(\S+)\s*->\s*(.*)$`)
)

// check compares doc with the module: every root file and package named, nothing named that
// is gone, and the arrows block equal to the imports between the module's packages.
func (g *graph) check(doc string) ([]string, error) {
	b, err := os.ReadFile(doc)
	if err != nil {
		return nil, err
	}
	named := map[string]bool{}
	docArrows := map[string]map[string]bool{}
	inArrows, sawArrows := false, false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			if inArrows {
				inArrows = false
			} else if strings.TrimSpace(strings.TrimPrefix(line, "```")) == "arrows" {
				inArrows, sawArrows = true, true
			}
			continue
		}
		if inArrows {
			if m := arrow.FindStringSubmatch(line); m != nil {
				from := m[1]
				if docArrows[from] == nil {
					docArrows[from] = map[string]bool{}
				}
				for _, to := range strings.Split(m[2], ",") {
					if to = strings.TrimSpace(to); to != "" && to != "(nothing)" {
						docArrows[from][to] = true
					}
				}
			}
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
			named[strings.TrimSuffix(m[1], "/")] = true
		}
	}
	var problems []string
	rootSet := map[string]bool{}
	for _, f := range g.rootFiles {
		rootSet[f] = true
		if !named[f] {
			problems = append(problems, fmt.Sprintf("root file %s exists but is not named", f))
		}
	}
	// A file named without a directory is a root file or a file of some package: it must exist.
	anyFile := map[string]bool{}
	for f := range g.lines {
		anyFile[filepath.Base(f)] = true
		anyFile[filepath.ToSlash(f)] = true
	}
	for n := range named {
		if strings.HasSuffix(n, ".go") && !strings.ContainsAny(n, "* ") && !strings.HasSuffix(n, "_test.go") && !anyFile[n] {
			problems = append(problems, fmt.Sprintf("names file %s, which is gone", n))
		}
	}
	for p := range g.pkgs {
		if p != "." && !named[p] {
			problems = append(problems, fmt.Sprintf("package %s exists but is not named", p))
		}
		if p != "." && docArrows[p] == nil && len(g.imports[p]) > 0 {
			problems = append(problems, fmt.Sprintf("package %s imports %v but has no arrow line", p, sortedKeys(g.imports[p])))
		}
	}
	if !sawArrows {
		problems = append(problems, "no ```arrows block")
	}
	for from, tos := range docArrows {
		name := from
		if from == "fencelock" {
			name = "."
		}
		if _, ok := g.pkgs[name]; !ok {
			problems = append(problems, fmt.Sprintf("arrows name package %s, which is gone", from))
			continue
		}
		want := map[string]bool{}
		for to := range tos {
			if to == "fencelock" {
				to = "."
			}
			want[to] = true
		}
		for to := range want {
			if !g.imports[name][to] {
				problems = append(problems, fmt.Sprintf("arrow %s -> %s: no such import", from, to))
			}
		}
		for to := range g.imports[name] {
			if !want[to] {
				problems = append(problems, fmt.Sprintf("%s imports %s: no arrow drawn", from, to))
			}
		}
	}
	if docArrows["fencelock"] == nil && len(g.imports["."]) > 0 {
		problems = append(problems, "the root package (fencelock) has no arrow line")
	}
	sort.Strings(problems)
	return problems, nil
}
