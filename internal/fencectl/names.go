package fencectl

import (
	"fmt"
	"strings"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// resourceType is a kind the plugin takes names of, with every spelling
// kubectl accepts for it in TYPE/NAME.
type resourceType struct {
	kind      string   // as in messages
	singular  string   // lower-case kind, the -o name prefix
	spellings []string // type names kubectl accepts (plural, short name)
}

var (
	lockGrantType      = resourceType{kind: "LockGrant", singular: "lockgrant", spellings: []string{"lockgrant", "lockgrants", "lg"}}
	fencedResourceType = resourceType{kind: "FencedResource", singular: "fencedresource", spellings: []string{"fencedresource", "fencedresources", "fr"}}
)

// objectName is kubectl's -o name form: lockgrant.locks.fencekeeper.dev/NAME.
func (t resourceType) objectName(name string) string {
	return t.singular + "." + locksv1.GroupVersion.Group + "/" + name
}

// nameArg reads a LOCKGRANT or FENCEDRESOURCE argument: a bare name, or
// kubectl's TYPE/NAME (lockgrant/x, lg/x, lockgrant.locks.fencekeeper.dev/x),
// so that what -o name prints can be passed straight back.
func (t resourceType) nameArg(arg string) (string, error) {
	typ, name, qualified := strings.Cut(arg, "/")
	if !qualified {
		return arg, nil
	}
	if name == "" || strings.Contains(name, "/") {
		return "", fmt.Errorf("%q is not a %s name (NAME or TYPE/NAME)", arg, t.kind)
	}
	typ = strings.TrimSuffix(strings.ToLower(typ), "."+locksv1.GroupVersion.Group)
	for _, s := range t.spellings {
		if typ == s {
			return name, nil
		}
	}
	return "", fmt.Errorf("%q names a %s, but this argument is a %s (e.g. %s)", arg, typ, t.kind, t.objectName(name))
}

// nameArgs rewrites the arguments in place to bare names (see nameArg).
func (t resourceType) nameArgs(args []string) error {
	for i, a := range args {
		name, err := t.nameArg(a)
		if err != nil {
			return err
		}
		args[i] = name
	}
	return nil
}
