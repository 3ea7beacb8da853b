package sqltrap

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// A Statement is a SQL text found in Go source.
type Statement struct {
	Where string // file:line, relative to the root given to GoStatements
	SQL   string
}

// reStatement matches a text that is a statement (after sqlc's "-- name:" comment lines).
var reStatement = regexp.MustCompile(`(?is)^\s*(?:--[^\n]*\n\s*)*(SELECT|WITH|INSERT|UPDATE|DELETE|VALUES)\b`)

// GoStatements returns the SQL statements written in the non-test Go files under root, in the
// directories dirs (relative to root; each searched recursively, except for the directories
// of skip): every string constant or literal that is a SELECT, WITH, INSERT, UPDATE, DELETE or
// VALUES statement. A constant made of literals and other string constants of its package
// joined with + is folded. A text with a fmt verb (%s, %[1]s, %q, %d, %I, %L) is a template:
// returned too, marked by its Where ending in " (template)", for the caller to skip.
func GoStatements(root string, dirs []string, skip []string) ([]Statement, error) {
	var out []Statement
	skipped := map[string]bool{}
	for _, s := range skip {
		skipped[filepath.Join(root, s)] = true
	}
	for _, dir := range dirs {
		pkgs := map[string][]string{}
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if skipped[path] {
					return filepath.SkipDir
				}
				return nil
			}
			if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
				pkgs[filepath.Dir(path)] = append(pkgs[filepath.Dir(path)], path)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		for _, files := range pkgs {
			st, err := packageStatements(root, files)
			if err != nil {
				return nil, err
			}
			out = append(out, st...)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Where < out[j].Where })
	return out, nil
}

var reVerb = regexp.MustCompile(`%(\[\d+\])?[sqdILvx]`)

func packageStatements(root string, files []string) ([]Statement, error) {
	fset := token.NewFileSet()
	var parsed []*ast.File
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		parsed = append(parsed, af)
	}
	// The package's string constants, folded over +, in as many passes as they need.
	consts := map[string]string{}
	type pending struct {
		name string
		expr ast.Expr
	}
	var todo []pending
	for _, af := range parsed {
		for _, decl := range af.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i < len(vs.Values) {
						todo = append(todo, pending{name.Name, vs.Values[i]})
					}
				}
			}
		}
	}
	for pass := 0; pass < 5; pass++ {
		for _, p := range todo {
			if _, done := consts[p.name]; done {
				continue
			}
			if v, ok := fold(p.expr, consts); ok {
				consts[p.name] = v
			}
		}
	}
	seen := map[string]bool{}
	var out []Statement
	add := func(pos token.Pos, sql string) {
		if !reStatement.MatchString(sql) || seen[sql] {
			return
		}
		seen[sql] = true
		p := fset.Position(pos)
		rel, err := filepath.Rel(root, p.Filename)
		if err != nil {
			rel = p.Filename
		}
		where := rel + ":" + strconv.Itoa(p.Line)
		if reVerb.MatchString(sql) {
			where += " (template)"
		}
		out = append(out, Statement{Where: where, SQL: sql})
	}
	for _, af := range parsed {
		ast.Inspect(af, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BinaryExpr:
				if v, ok := fold(n, consts); ok {
					add(n.Pos(), v)
					return false
				}
			case *ast.BasicLit:
				if v, ok := fold(n, consts); ok {
					add(n.Pos(), v)
				}
			}
			return true
		})
	}
	return out, nil
}

// fold returns the value of a string expression made of literals and the constants of consts
// joined with +.
func fold(e ast.Expr, consts map[string]string) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		v, err := strconv.Unquote(e.Value)
		return v, err == nil
	case *ast.Ident:
		v, ok := consts[e.Name]
		return v, ok
	case *ast.ParenExpr:
		return fold(e.X, consts)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		l, ok := fold(e.X, consts)
		if !ok {
			return "", false
		}
		r, ok := fold(e.Y, consts)
		return l + r, ok
	}
	return "", false
}
