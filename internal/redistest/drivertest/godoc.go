package drivertest

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// CheckGoDoc checks what go doc shows of the driver package in the working
// directory: the Locker's methods, exactly methods, each documented; every
// Options field documented with its default; no exported alias.
func CheckGoDoc(t *testing.T, methods []string) {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, "example.com/driver")
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]*doc.Type{}
	for _, typ := range p.Types {
		types[typ.Name] = typ
		for _, spec := range typ.Decl.Specs {
			if ts := spec.(*ast.TypeSpec); ts.Assign.IsValid() {
				t.Errorf("type %s is an alias", ts.Name.Name)
			}
		}
	}
	l, o := types["Locker"], types["Options"]
	if l == nil || o == nil {
		t.Fatalf("go doc shows no Locker or no Options")
	}
	var got []string
	for _, m := range l.Methods {
		got = append(got, m.Name)
		if strings.TrimSpace(m.Doc) == "" {
			t.Errorf("Locker.%s has no documentation", m.Name)
		}
	}
	if !slices.Equal(got, methods) {
		t.Errorf("go doc lists the Locker methods %v, want %v", got, methods)
	}
	st := o.Decl.Specs[0].(*ast.TypeSpec).Type.(*ast.StructType)
	if len(st.Fields.List) == 0 {
		t.Fatal("Options has no fields")
	}
	for _, f := range st.Fields.List {
		if !strings.Contains(f.Doc.Text(), "Default") {
			t.Errorf("Options.%s: its documentation does not state its default", f.Names[0].Name)
		}
	}
}
