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
	"flag"
	"fmt"
	"os"
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
