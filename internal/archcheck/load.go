package main

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/types"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/tools/go/packages"
)

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
