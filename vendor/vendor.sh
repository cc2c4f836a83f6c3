#!/usr/bin/env bash
# The patched crates.io packages under vendor/: re-create them, check them,
# rewrite their patches, run their own tests. See vendor/README.md.
#
#   vendor/vendor.sh sync              copy each package from its .crate and apply its patch
#   vendor/vendor.sh check             fail if vendor/ differs from what `sync` makes, or a
#                                      patch does not apply
#   vendor/vendor.sh diff              rewrite each vendored package's patch from vendor/NAME
#   vendor/vendor.sh unpack NAME DIR   the published NAME with its patch applied, at DIR
#   vendor/vendor.sh diff NAME DIR     rewrite NAME's patch from DIR (lapin's, say, after
#                                      `unpack lapin DIR` and an edit)
#   vendor/vendor.sh test              run the tests of each patched package, and lapin's
#                                      (with its own patch, on the patched packages)
#
# A package comes from the cargo cache (~/.cargo/registry/cache) when it is
# there, else from static.crates.io; its SHA-256 is checked either way.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")

# name, version, SHA-256 of the .crate (the checksum Cargo.lock gave it
# before the [patch]).
vendored=(
	"amq-protocol-types 10.6.3 8a268a50e97bd5d52292a8b96636f6436215def6f3d128fb8218318f5feb4c33"
	"amq-protocol 10.6.3 b63f30a81ad95c7a278080be6d993d5b3e971d93e1b00bd894067220fc756804"
)
# Patched for upstream (a test and documentation) but not vendored: its code
# is unchanged, and it takes the fix through amq-protocol.
patched_only=(
	"lapin 4.12.3 3212643cc0031d982f81a62360998106268587237d81d6e8501a0a323e13b656"
)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# pristine NAME VERSION SHA256: unpacks the published package into
# $work/pristine/NAME and prints that directory.
pristine() {
	local name=$1 version=$2 sha=$3 crate
	crate=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$name-$version.crate" 2>/dev/null | head -n 1 || true)
	if [[ -z $crate ]]; then
		crate=$work/$name-$version.crate
		curl -sSfL -o "$crate" "https://static.crates.io/crates/$name/$name-$version.crate"
	fi
	if ! echo "$sha  $crate" | sha256sum --check --quiet -; then
		echo "$crate: not the published $name $version (SHA-256 differs)" >&2
		exit 1
	fi
	mkdir -p "$work/pristine"
	rm -rf "${work:?}/pristine/$name"
	tar -xzf "$crate" -C "$work/pristine"
	mv "$work/pristine/$name-$version" "$work/pristine/$name"
	echo "$work/pristine/$name"
}

# patched NAME VERSION SHA256 DEST: the published package with its patch
# applied, at DEST.
patched() {
	local name=$1 version=$2 sha=$3 dest=$4 src
	src=$(pristine "$name" "$version" "$sha")
	rm -rf "$dest"
	cp -a "$src" "$dest"
	patch --quiet --no-backup-if-mismatch -p1 -d "$dest" <"$here/patches/$name-$version.patch"
}

# find_entry NAME: the "name version sha256" line of NAME.
find_entry() {
	local entry
	for entry in "${vendored[@]}" "${patched_only[@]}"; do
		if [[ ${entry%% *} == "$1" ]]; then
			echo "$entry"
			return
		fi
	done
	echo "no patched package named $1" >&2
	exit 2
}

cmd=${1:-}
case $cmd in
sync)
	for entry in "${vendored[@]}"; do
		read -r name version sha <<<"$entry"
		patched "$name" "$version" "$sha" "$here/$name"
		echo "vendor/$name: $name $version with patches/$name-$version.patch"
	done
	;;
check)
	status=0
	for entry in "${vendored[@]}"; do
		read -r name version sha <<<"$entry"
		patched "$name" "$version" "$sha" "$work/$name"
		if ! diff -r "$work/$name" "$here/$name" >&2; then
			echo "vendor/$name differs from $name $version with its patch: run vendor/vendor.sh diff (to keep the edit) or sync (to drop it)" >&2
			status=1
		fi
	done
	for entry in "${patched_only[@]}"; do
		read -r name version sha <<<"$entry"
		patched "$name" "$version" "$sha" "$work/$name"
	done
	[[ $status == 0 ]] && echo "vendor/ is the published packages with their patches"
	exit $status
	;;
diff)
	if [[ $# == 3 ]]; then
		targets=("$2 $3")
	else
		targets=()
		for entry in "${vendored[@]}"; do
			read -r name version sha <<<"$entry"
			targets+=("$name $here/$name")
		done
	fi
	for target in "${targets[@]}"; do
		read -r name dir <<<"$target"
		entry=$(find_entry "$name")
		read -r name version sha <<<"$entry"
		src=$(pristine "$name" "$version" "$sha")
		mkdir -p "$work/diff"
		rm -rf "$work/diff/a" "$work/diff/b"
		cp -a "$src" "$work/diff/a"
		cp -a "$dir" "$work/diff/b"
		(cd "$work/diff" && git diff --no-index --no-prefix a b >"$here/patches/$name-$version.patch") || [[ $? == 1 ]]
		echo "patches/$name-$version.patch: $(grep -c '^+++ ' "$here/patches/$name-$version.patch") files"
	done
	;;
unpack)
	[[ $# == 3 ]] || { echo "usage: vendor/vendor.sh unpack NAME DIR" >&2; exit 2; }
	entry=$(find_entry "$2")
	read -r name version sha <<<"$entry"
	patched "$name" "$version" "$sha" "$3"
	echo "$3: $name $version with patches/$name-$version.patch"
	;;
test)
	# Copies outside the workspace (cargo would take them for its members),
	# built into the workspace's target directory.
	export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}/vendor-test
	patch_args=()
	for entry in "${vendored[@]}"; do
		read -r name version sha <<<"$entry"
		cp -a "$here/$name" "$work/$name"
		patch_args+=(--config "patch.crates-io.$name.path=\"$work/$name\"")
	done
	(cd "$work/amq-protocol-types" && cargo test --all-features)
	(cd "$work/amq-protocol" && cargo test --no-default-features "${patch_args[@]}")
	for entry in "${patched_only[@]}"; do
		read -r name version sha <<<"$entry"
		patched "$name" "$version" "$sha" "$work/$name"
	done
	(cd "$work/lapin" && cargo test --lib --no-default-features --features default-runtime "${patch_args[@]}")
	;;
*)
	awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
	exit 2
	;;
esac
