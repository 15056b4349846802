// Package v1alpha1 contains the fencekeeper API: FencedResource, the canonical
// registry entry of one protected resource, and LockGrant, one acquisition
// attempt and, once issued, its signed grant.
//
// +kubebuilder:object:generate=true
// +groupName=locks.fencekeeper.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is group version used to register these objects.
	GroupVersion = schema.GroupVersion{Group: "locks.fencekeeper.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the API's types. It is initialized with them
	// (not from init functions) so that Scheme, a package variable built from
	// it, always knows them.
	SchemeBuilder = (&scheme.Builder{GroupVersion: GroupVersion}). //nolint:staticcheck // SA1019: the kubebuilder layout; controller-runtime is already a dependency of every importer
			Register(&FencedResource{}, &FencedResourceList{}, &LockGrant{}, &LockGrantList{})

	// AddToScheme adds the types in this group-version to the given scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
