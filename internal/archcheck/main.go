// Command archcheck measures the shape of fencelock's library module and checks that
// docs/ARCHITECTURE.md still describes it.
//
//	GOWORK=off go run -C internal/archcheck . -C "$PWD" [-doc "$PWD/docs/ARCHITECTURE.md"] [-report] [-arrows]
//
// It loads every package of the module github.com/fencelock/fencelock (not its test files)
// with golang.org/x/tools/go/packages and builds a graph by go/types references: a node is a
// file of the root package or a whole package elsewhere, and an edge runs from the node that
// uses a name to the node that declares it. From that graph it reports:
//
//   - the exported names of each package (package-level names, as go doc lists them),
//   - the largest set of root files that all reach each other (a strongly connected component),
//   - floors and upward uses: nodes ordered so that each stands above what it uses; inside a
//     loop the order that leaves the fewest uses pointing up is chosen greedily (Eades, Lin and
//     Smyth, 1993), those uses are counted as upward, and the floors are the longest chain of
//     the remaining uses,
//   - lines per non-generated file, and those over 400.
//
// With -doc it also fails (exit 1) when the document names a root file or package that is
// gone, does not name one that exists, or when its arrows block (a fenced block whose info
// string is "arrows", lines "pkg -> dep, dep") differs from the module's imports between its
// packages. Exit status 2 reports a tool failure.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"go/ast"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"golang.org/x/tools/go/packages"
)

const module = "github.com/fencelock/fencelock"

func main() {
	doc := flag.String("doc", "", "check this Markdown file against the module (docs/ARCHITECTURE.md)")
	report := flag.Bool("report", false, "print the measures")
	dir := flag.String("C", ".", "the module's directory")
	arrows := flag.Bool("arrows", false, "print the arrows block that docs/ARCHITECTURE.md needs")
	flag.Parse()
	g, err := load(*dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "archcheck:", err)
		os.Exit(2)
	}
	if *arrows {
		g.printArrows(os.Stdout)
		return
	}
	if *report || *doc == "" {
		g.report(os.Stdout)
	}
	if *doc != "" {
		problems, err := g.check(*doc)
		if err != nil {
			fmt.Fprintln(os.Stderr, "archcheck:", err)
			os.Exit(2)
		}
		for _, p := range problems {
			fmt.Println("ARCHITECTURE:", p)
		}
		if len(problems) > 0 {
			os.Exit(1)
		}
		fmt.Printf("%s matches the module: %d packages, %d root files, %d arrows\n", *doc, len(g.pkgs), len(g.rootFiles), len(g.imports))
	}
}

type graph struct {
	pkgs      map[string]*packages.Package // by path relative to the module ("." for the root)
	rootFiles []string                     // base names of the root package's files
	nodes     []string
	edges     map[string]map[string]bool // node -> nodes it uses
	imports   map[string]map[string]bool // package -> module packages it imports
	exported  map[string][]string
	lines     map[string]int // file (relative) -> lines
	generated map[string]bool
}

func rel(path string) string {
	if path == module {
		return "."
	}
	return strings.TrimPrefix(path, module+"/")
}

func load(dir string) (*graph, error) {
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedImports | packages.NeedTypes |
			packages.NeedSyntax | packages.NeedTypesInfo | packages.NeedModule,
		Dir: dir,
		Env: append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod"),
	}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		return nil, err
	}
	g := &graph{
		pkgs: map[string]*packages.Package{}, edges: map[string]map[string]bool{},
		imports: map[string]map[string]bool{}, exported: map[string][]string{},
		lines: map[string]int{}, generated: map[string]bool{},
	}
	for _, p := range pkgs {
		if len(p.Errors) > 0 {
			return nil, fmt.Errorf("%s: %v", p.PkgPath, p.Errors[0])
		}
		if p.Module == nil || p.Module.Path != module {
			continue
		}
		g.pkgs[rel(p.PkgPath)] = p
	}
	root := g.pkgs["."]
	if root == nil {
		return nil, fmt.Errorf("no root package in %s", dir)
	}
	nodeOf := func(p *types.Package, file string) string {
		if p.Path() == module {
			return filepath.Base(file)
		}
		return rel(p.Path())
	}
	for name, p := range g.pkgs {
		g.imports[name] = map[string]bool{}
		for path := range p.Imports {
			if strings.HasPrefix(path, module+"/") || path == module {
				g.imports[name][rel(path)] = true
			}
		}
		scope := p.Types.Scope()
		for _, n := range scope.Names() {
			if !ast.IsExported(n) {
				continue
			}
			g.exported[name] = append(g.exported[name], n)
			// Exported methods of an exported type count too, as go doc lists them.
			if tn, ok := scope.Lookup(n).(*types.TypeName); ok && !tn.IsAlias() {
				ms := types.NewMethodSet(types.NewPointer(tn.Type()))
				for i := 0; i < ms.Len(); i++ {
					if m := ms.At(i).Obj(); m.Exported() && m.Pkg() == p.Types {
						if _, isIface := tn.Type().Underlying().(*types.Interface); !isIface {
							g.exported[name] = append(g.exported[name], n+"."+m.Name())
						}
					}
				}
			}
		}
		for i, f := range p.Syntax {
			_ = i
			file := p.Fset.Position(f.Pos()).Filename
			relFile, _ := filepath.Rel(dir, file)
			g.lines[relFile] = countLines(file)
			g.generated[relFile] = ast.IsGenerated(f)
			from := nodeOf(p.Types, file)
			if name == "." {
				g.rootFiles = append(g.rootFiles, from)
			}
			if g.edges[from] == nil {
				g.edges[from] = map[string]bool{}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				id, ok := n.(*ast.Ident)
				if !ok {
					return true
				}
				obj := p.TypesInfo.Uses[id]
				if obj == nil || obj.Pkg() == nil || !obj.Pos().IsValid() {
					return true
				}
				op := obj.Pkg().Path()
				if op != module && !strings.HasPrefix(op, module+"/") {
					return true
				}
				if _, ok := g.pkgs[rel(op)]; !ok {
					return true
				}
				to := nodeOf(obj.Pkg(), p.Fset.Position(obj.Pos()).Filename)
				if to != from {
					g.edges[from][to] = true
				}
				return true
			})
		}
	}
	for n := range g.edges {
		g.nodes = append(g.nodes, n)
	}
	sort.Strings(g.nodes)
	sort.Strings(g.rootFiles)
	return g, nil
}

func countLines(file string) int {
	f, err := os.Open(file)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		n++
	}
	return n
}

// sccs returns the strongly connected components of g's nodes (Tarjan).
func (g *graph) sccs() [][]string {
	index, low := map[string]int{}, map[string]int{}
	on := map[string]bool{}
	var stack []string
	var out [][]string
	i := 0
	var visit func(string)
	visit = func(v string) {
		index[v], low[v] = i, i
		i++
		stack = append(stack, v)
		on[v] = true
		for _, w := range sortedKeys(g.edges[v]) {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			var c []string
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				on[w] = false
				c = append(c, w)
				if w == v {
					break
				}
			}
			sort.Strings(c)
			out = append(out, c)
		}
	}
	for _, v := range g.nodes {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// order puts the nodes of one component in a sequence, users before what they use, leaving
// few uses that point backwards (Eades, Lin and Smyth's greedy heuristic).
func (g *graph) order(c []string) []string {
	left := map[string]bool{}
	for _, v := range c {
		left[v] = true
	}
	deg := func(v string, out bool) int {
		n := 0
		for _, w := range c {
			if !left[w] || w == v {
				continue
			}
			if out && g.edges[v][w] || !out && g.edges[w][v] {
				n++
			}
		}
		return n
	}
	var head, tail []string
	for len(left) > 0 {
		changed := true
		for changed {
			changed = false
			for _, v := range c {
				if left[v] && deg(v, true) == 0 { // uses nothing left: goes to the bottom
					tail = append([]string{v}, tail...)
					delete(left, v)
					changed = true
				} else if left[v] && deg(v, false) == 0 { // used by nothing left: top
					head = append(head, v)
					delete(left, v)
					changed = true
				}
			}
		}
		best, bestScore := "", -1<<30
		for _, v := range c {
			if left[v] {
				if s := deg(v, true) - deg(v, false); s > bestScore {
					best, bestScore = v, s
				}
			}
		}
		if best != "" {
			head = append(head, best)
			delete(left, best)
		}
	}
	return append(head, tail...)
}

// levels returns each node's floor (1 = uses nothing in the module) and the uses that point up.
func (g *graph) levels() (map[string]int, [][2]string) {
	pos := map[string]int{}
	var up [][2]string
	for _, c := range g.sccs() {
		for i, v := range g.order(c) {
			pos[v] = i
		}
		in := map[string]bool{}
		for _, v := range c {
			in[v] = true
		}
		for _, v := range c {
			for w := range g.edges[v] {
				if in[w] && pos[w] < pos[v] {
					up = append(up, [2]string{v, w})
				}
			}
		}
	}
	isUp := map[[2]string]bool{}
	for _, e := range up {
		isUp[e] = true
	}
	level := map[string]int{}
	var depth func(string, map[string]bool) int
	depth = func(v string, path map[string]bool) int {
		if l, ok := level[v]; ok {
			return l
		}
		path[v] = true
		l := 1
		for w := range g.edges[v] {
			if isUp[[2]string{v, w}] || path[w] {
				continue
			}
			l = max(l, depth(w, path)+1)
		}
		delete(path, v)
		level[v] = l
		return l
	}
	for _, v := range g.nodes {
		depth(v, map[string]bool{})
	}
	sort.Slice(up, func(i, j int) bool { return up[i][0]+up[i][1] < up[j][0]+up[j][1] })
	return level, up
}

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
