package fence

// ProtectionRemoved: a write to an enforced target drops the protected label
// or the annotation naming its entry. (Temporary home until the verdict list
// in decide.go gains it.)
const ProtectionRemoved Verdict = "PROTECTION_REMOVED"

// DeleteNotDeclared: a DELETE without a declared intent of the current holder.
const DeleteNotDeclared Verdict = "DELETE_NOT_DECLARED"
