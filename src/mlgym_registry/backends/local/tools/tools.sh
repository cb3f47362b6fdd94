# Tool commands of the local backend: MLGym's tool language, implemented for mlgym-registry.
# Sourced into the agent's bash session. Needs: MLGR_PYTHON (an interpreter with flake8) and MLGR_TOOLS (this folder).
# Window state lives in the shell variables CURRENT_FILE, CURRENT_LINE, WINDOW and OVERLAP, as in MLGym.

# The open file and the working directory as one line of JSON, whatever characters their names hold: backslash,
# double quote and control characters are escaped by bash itself (state runs after every step, so it starts no process
# but MLGym's realpath of the open file).
state() {
    local __mlgr_value __mlgr_i __mlgr_hex __mlgr_char __mlgr_fields=() __mlgr_file=n/a
    if [ -n "${CURRENT_FILE:-}" ]; then __mlgr_file=$(realpath "$CURRENT_FILE"); fi
    for __mlgr_value in "$__mlgr_file" "${PWD:-$(builtin pwd)}"; do
        __mlgr_value=${__mlgr_value//'\'/'\\'}
        __mlgr_value=${__mlgr_value//'"'/'\"'}
        if [[ $__mlgr_value == *[[:cntrl:]]* ]]; then
            __mlgr_value=${__mlgr_value//$'\n'/'\n'}
            __mlgr_value=${__mlgr_value//$'\t'/'\t'}
            __mlgr_value=${__mlgr_value//$'\r'/'\r'}
            for (( __mlgr_i = 1; __mlgr_i < 32; __mlgr_i++ )); do
                builtin printf -v __mlgr_hex '%02x' "$__mlgr_i"
                builtin printf -v __mlgr_char "\\x$__mlgr_hex"
                __mlgr_value=${__mlgr_value//"$__mlgr_char"/"\\u00$__mlgr_hex"}
            done
        fi
        __mlgr_fields+=("\"$__mlgr_value\"")
    done
    builtin printf '{"open_file": %s, "working_dir": %s}\n' "${__mlgr_fields[@]}"
}

_mlgr_lines() {
    awk 'END {print NR}' "$1"
}

# Print the window of CURRENT_FILE centred on CURRENT_LINE (integer arithmetic on doubled values, so that an odd
# WINDOW rounds the way MLGym's window does).
_mlgr_print() {
    local total w cl above below upto
    total=$(_mlgr_lines "$CURRENT_FILE")
    w=$WINDOW
    cl=$CURRENT_LINE
    echo "[File: $(realpath "$CURRENT_FILE") ($total lines total)]"
    above=0
    if (( 2 * cl - w > 0 )); then above=$(( (2 * cl - w) / 2 )); fi
    below=0
    if (( 2 * total - 2 * cl - w > 0 )); then below=$(( (2 * total - 2 * cl - w + 1) / 2 )); fi
    if (( above > 0 )); then echo "($above more lines above)"; fi
    if (( cl > 0 )); then upto=$(( (2 * cl + w) / 2 )); else upto=$(( w / 2 )); fi
    grep -n $ "$CURRENT_FILE" | head -n "$upto" | tail -n "$w"
    if (( below > 0 )); then echo "($below more lines below)"; fi
}

_mlgr_constrain() {
    local max_line half
    max_line=$(_mlgr_lines "$CURRENT_FILE")
    half=$(( WINDOW / 2 ))
    if (( CURRENT_LINE > max_line - half )); then CURRENT_LINE=$(( max_line - half )); fi
    if (( CURRENT_LINE < half )); then CURRENT_LINE=$half; fi
    export CURRENT_LINE
}

_mlgr_need_file() {
    if [ -z "$CURRENT_FILE" ]; then
        echo "No file is open. Open one first with: open \"<path>\""
        return 1
    fi
}

open() {
    if [ -z "$1" ]; then
        echo "Usage: open \"<path>\" [<line_number>]"
        return
    fi
    if [ -d "$1" ]; then
        echo "Error: $1 is a directory, not a file. Use ls or cd to look inside it."
        return
    fi
    if [ ! -f "$1" ]; then
        echo "File $1 not found"
        return
    fi
    if command -v file >/dev/null 2>&1 && file -b --mime-type "$1" | grep -q image; then
        echo "Error: $1 is an image; this editor shows text files only."
        return
    fi
    local line_number
    if [ -n "$2" ]; then
        if ! [[ $2 =~ ^[0-9]+$ ]]; then
            echo "Usage: open \"<path>\" [<line_number>]"
            echo "Error: the line number must be a whole number, got '$2'"
            return
        fi
        if [ "$(wc -c < "$1")" -gt 20000 ]; then
            echo "The file has more than 20000 characters; use 'head -n NUM_LINES' or open it without a line number"
            return
        fi
        local max_line
        max_line=$(_mlgr_lines "$1")
        if (( $2 > max_line )); then
            echo "Warning: line $2 is past the end of the file ($max_line lines)"
            echo "Warning: showing line $max_line instead"
            line_number=$max_line
        elif (( $2 < 1 )); then
            echo "Warning: line $2 is before the start of the file"
            echo "Warning: showing line 1 instead"
            line_number=1
        else
            line_number=$(( (2 * $2 + WINDOW - 2 * (WINDOW / 6)) / 2 ))
            if (( line_number < 1 )); then line_number=1; fi
        fi
    else
        line_number=$(( WINDOW / 2 ))
    fi
    CURRENT_FILE=$(realpath "$1")
    CURRENT_LINE=$line_number
    export CURRENT_FILE CURRENT_LINE
    _mlgr_constrain
    _mlgr_print
}

goto() {
    if [ $# -gt 1 ]; then
        echo "goto takes a single line number."
        return
    fi
    _mlgr_need_file || return
    if [ -z "$1" ]; then
        echo "Usage: goto <line_number>"
        return
    fi
    if ! [[ $1 =~ ^[0-9]+$ ]]; then
        echo "Usage: goto <line_number>"
        echo "Error: the line number must be a whole number, got '$1'"
        return
    fi
    local max_line
    max_line=$(_mlgr_lines "$CURRENT_FILE")
    if (( $1 > max_line )); then
        echo "Error: the file has only $max_line lines; pick a line number up to $max_line"
        return
    fi
    CURRENT_LINE=$(( (2 * $1 + WINDOW - 2 * (WINDOW / 6)) / 2 ))
    if (( CURRENT_LINE < 1 )); then CURRENT_LINE=1; fi
    export CURRENT_LINE
    _mlgr_constrain
    _mlgr_print
}

_mlgr_scroll_warning() {
    SCROLL_COUNT=${SCROLL_COUNT:-0}
    if [ "$LAST_ACTION" != "scroll_up" ] && [ "$LAST_ACTION" != "scroll_down" ]; then
        SCROLL_COUNT=0
    fi
    SCROLL_COUNT=$(( SCROLL_COUNT + 1 ))
    export SCROLL_COUNT
    if (( SCROLL_COUNT >= ${WARN_AFTER_SCROLLING_TIMES:-3} )); then
        echo "WARNING: scrolling again and again is a slow way to read a file."
        echo "If you know what you are looking for, use \`search_file <pattern>\` or \`goto <line_number>\`."
    fi
}

scroll_down() {
    _mlgr_need_file || return
    CURRENT_LINE=$(( CURRENT_LINE + WINDOW - OVERLAP ))
    export CURRENT_LINE
    _mlgr_constrain
    _mlgr_print
    _mlgr_scroll_warning
}

scroll_up() {
    _mlgr_need_file || return
    CURRENT_LINE=$(( CURRENT_LINE - WINDOW + OVERLAP ))
    export CURRENT_LINE
    _mlgr_constrain
    _mlgr_print
    _mlgr_scroll_warning
}

create() {
    if [ -z "$1" ]; then
        echo "Usage: create <filename>"
        return
    fi
    if [ -e "$1" ]; then
        echo "Error: File '$1' already exists; opening it instead."
        open "$1"
        return
    fi
    printf "\n" > "$1" || return
    open "$1"
}

search_dir() {
    local term dir
    if [ $# -eq 1 ]; then
        term="$1"
        dir="./"
    elif [ $# -eq 2 ]; then
        term="$1"
        if [ ! -d "$2" ]; then
            echo "Directory $2 not found"
            return
        fi
        dir="$2"
    else
        echo "Usage: search_dir <search_term> [<dir>]"
        return
    fi
    dir=$(realpath "$dir")
    local counts
    counts=$(find "$dir" -type f ! -path '*/.*' -exec grep -nIH -- "$term" {} + 2>/dev/null | cut -d: -f1 | sort | uniq -c)
    if [ -z "$counts" ]; then
        echo "No matches found for \"$term\" in $dir"
        return
    fi
    local n_matches n_files
    n_matches=$(echo "$counts" | awk '{s += $1} END {print s}')
    n_files=$(echo "$counts" | wc -l | tr -d ' ')
    if (( n_files > 100 )); then
        echo "More than $n_files files matched for \"$term\" in $dir. Please narrow your search."
        return
    fi
    echo "Found $n_matches matches for \"$term\" in $dir:"
    echo "$counts" | awk '{n = $1; $1 = ""; sub(/^ /, ""); print $0 " (" n " matches)"}'
    echo "End of matches for \"$term\" in $dir"
}

search_file() {
    if [ -z "$1" ]; then
        echo "Usage: search_file <search_term> [<file>]"
        return
    fi
    local file
    if [ -n "$2" ]; then
        if [ ! -f "$2" ]; then
            echo "Usage: search_file <search_term> [<file>]"
            echo "Error: file $2 not found. Give the path of an existing file."
            return
        fi
        file="$2"
    else
        _mlgr_need_file || return
        file="$CURRENT_FILE"
    fi
    file=$(realpath "$file")
    local matches
    matches=$(grep -n -- "$1" "$file")
    if [ -z "$matches" ]; then
        echo "No matches found for \"$1\" in $file"
        return
    fi
    local n_lines
    n_lines=$(echo "$matches" | wc -l | tr -d ' ')
    if (( n_lines > 100 )); then
        echo "More than $n_lines lines matched for \"$1\" in $file. Please narrow your search."
        return
    fi
    echo "Found $n_lines matches for \"$1\" in $file:"
    echo "$matches" | awk '{i = index($0, ":"); print "Line " substr($0, 1, i - 1) ":" substr($0, i + 1)}'
    echo "End of matches for \"$1\" in $file"
}

find_file() {
    local name dir
    if [ $# -eq 1 ]; then
        name="$1"
        dir="./"
    elif [ $# -eq 2 ]; then
        name="$1"
        if [ ! -d "$2" ]; then
            echo "Directory $2 not found"
            return
        fi
        dir="$2"
    else
        echo "Usage: find_file <file_name> [<dir>]"
        return
    fi
    dir=$(realpath "$dir")
    local matches
    matches=$(find "$dir" -type f -name "$name")
    if [ -z "$matches" ]; then
        echo "No matches found for \"$name\" in $dir"
        return
    fi
    echo "Found $(echo "$matches" | wc -l | tr -d ' ') matches for \"$name\" in $dir:"
    echo "$matches"
}

# edit and insert read their text from stdin (a here-document). The helper prints the new CURRENT_LINE on its first
# line and the observation after it.
_mlgr_change() {
    _mlgr_need_file || return
    local out rc first
    out=$("$MLGR_PYTHON" "$MLGR_TOOLS/edit_file.py" "$1" "$CURRENT_FILE" "$2" "$CURRENT_LINE" "$WINDOW")
    rc=$?
    first=${out%%$'\n'*}
    if [[ $first =~ ^-?[0-9]+$ ]]; then
        CURRENT_LINE=$first
        export CURRENT_LINE
        if [[ $out == *$'\n'* ]]; then printf '%s\n' "${out#*$'\n'}"; fi
    else
        printf '%s\n' "$out"
    fi
    return $rc
}

edit() {
    _mlgr_change edit "$1"
}

insert() {
    _mlgr_change insert "$1"
}

validate() {
    echo "<<VALIDATION||"
    echo "evaluating the current solution"
    echo "||VALIDATION>>"
}

submit() {
    echo "<<SUBMISSION||"
    echo "submitting the current solution"
    echo "||SUBMISSION>>"
}
