package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/tools/go/packages"
)

func (g *graph) report(w *os.File) {
	fmt.Fprintln(w, "exported names per package:")
	total := 0
	for _, p := range sortedPkgs(g.pkgs) {
		fmt.Fprintf(w, "  %-24s %d\n", p, len(g.exported[p]))
		total += len(g.exported[p])
	}
	fmt.Fprintf(w, "  %-24s %d\n", "(all)", total)
	largest := []string{}
	rootSet := map[string]bool{}
	for _, f := range g.rootFiles {
		rootSet[f] = true
	}
	for _, c := range g.sccs() {
		var files []string
		for _, v := range c {
			if rootSet[v] {
				files = append(files, v)
			}
		}
		if len(files) > len(largest) {
			largest = files
		}
	}
	fmt.Fprintf(w, "largest set of root files that all reach each other: %d %v\n", len(largest), largest)
	pairs := 0
	for _, a := range g.rootFiles {
		for _, b := range g.rootFiles {
			if a < b && g.edges[a][b] && g.edges[b][a] {
				pairs++
			}
		}
	}
	fmt.Fprintf(w, "pairs of root files that use each other: %d\n", pairs)
	level, up := g.levels()
	floors := 0
	for _, l := range level {
		floors = max(floors, l)
	}
	fmt.Fprintf(w, "nodes (root files and packages): %d, floors: %d, upward uses: %d\n", len(g.nodes), floors, len(up))
	for _, e := range up {
		fmt.Fprintf(w, "  up: %s -> %s\n", e[0], e[1])
	}
	// The longest chain of uses, top down: what sets the number of floors.
	var top string
	for _, v := range g.nodes {
		if level[v] == floors && (top == "" || v < top) {
			top = v
		}
	}
	chain := []string{top}
	for v := top; level[v] > 1; {
		next := ""
		for _, w := range sortedKeys(g.edges[v]) {
			if level[w] == level[v]-1 && !isUpEdge(up, v, w) {
				next = w
				break
			}
		}
		if next == "" {
			break
		}
		chain = append(chain, next)
		v = next
	}
	fmt.Fprintf(w, "  longest chain: %s\n", strings.Join(chain, " -> "))
	byFloor := map[int][]string{}
	for v, l := range level {
		byFloor[l] = append(byFloor[l], v)
	}
	for l := 1; l <= floors; l++ {
		sort.Strings(byFloor[l])
		fmt.Fprintf(w, "  floor %d: %s\n", l, strings.Join(byFloor[l], " "))
	}
	rootLines := 0
	var big []string
	for _, f := range sortedKeysInt(g.lines) {
		if !strings.Contains(f, string(filepath.Separator)) {
			rootLines += g.lines[f]
		}
		if g.lines[f] > 400 && !g.generated[f] {
			big = append(big, fmt.Sprintf("%s (%d)", f, g.lines[f]))
		}
	}
	fmt.Fprintf(w, "root package: %d files, %d lines; files over 400 lines (not generated): %d %v\n", len(g.rootFiles), rootLines, len(big), big)
}

// printArrows prints the imports between the module's packages as the arrows block of
// docs/ARCHITECTURE.md expects them: one line per importing package, the root named fencelock.
func (g *graph) printArrows(w *os.File) {
	name := func(p string) string {
		if p == "." {
			return "fencelock"
		}
		return p
	}
	fmt.Fprintln(w, "```arrows")
	for _, p := range sortedPkgs(g.pkgs) {
		if len(g.imports[p]) == 0 {
			continue
		}
		var tos []string
		for _, t := range sortedKeys(g.imports[p]) {
			tos = append(tos, name(t))
		}
		fmt.Fprintf(w, "%s -> %s\n", name(p), strings.Join(tos, ", "))
	}
	fmt.Fprintln(w, "```")
}

func isUpEdge(up [][2]string, from, to string) bool {
	for _, e := range up {
		if e[0] == from && e[1] == to {
			return true
		}
	}
	return false
}

func sortedKeysInt(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sortedPkgs(m map[string]*packages.Package) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
