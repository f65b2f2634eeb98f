package coordinator_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The engine imports the standard library only: no fx, zap, Prometheus or
// Redis. Of ours it imports its two halves for store and observer writers,
// idemstore and idemevent, and the adapters' internal bridge, unprotected,
// which import the standard library and idemstore only.
func TestStandardLibraryOnly(t *testing.T) {
	ours := map[string][]string{
		".":                       {"github.com/idemkit/idempotency/coordinator/idemstore", "github.com/idemkit/idempotency/coordinator/idemevent", "github.com/idemkit/idempotency/internal/unprotected"},
		"idemstore":               nil,
		"idemevent":               {"github.com/idemkit/idempotency/coordinator/idemstore"},
		"../internal/unprotected": nil,
	}
	checked := 0
	for dir, allowed := range ours {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") && !slices.Contains(allowed, path) {
					t.Errorf("%s imports %s: the engine uses the standard library only", name, path)
				}
			}
			checked++
		}
	}
	if checked < 8 {
		t.Fatalf("checked %d files; is the test running in the package directory?", checked)
	}
}

// The package an application imports keeps to what an application calls:
// at most 100 exported names, none of them a store's or an observer's
// (those live in idemstore and idemevent).
func TestExportsStaySmall(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.IsExported() {
					names = append(names, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names = append(names, s.Name.Name)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names = append(names, n.Name)
							}
						}
					}
				}
			}
		}
	}
	if len(names) > 100 {
		t.Errorf("coordinator exports %d names, more than 100", len(names))
	}
	if len(names) < 30 {
		t.Fatalf("found %d exported names; is the test running in the package directory?", len(names))
	}
	for _, n := range []string{"Store", "Record", "Write", "Completion", "Claim", "Event", "Observer", "Method"} {
		if slices.Contains(names, n) {
			t.Errorf("coordinator exports %s, which belongs to idemstore or idemevent", n)
		}
	}
}
