//! Digest 001 §7.3 item 4: cost extraction reproduces the op sequences of Figs 4.17–4.20,
//! for the Rust equivalents of the thesis's Java listings. The opaque blocks of the figures
//! (`bloco1` … `bloco4`) are small functions with one distinct op each, so each block's cost is
//! visible in the output: bloco1 = `assign_long`, bloco2 = `assign_short`, bloco3 =
//! `assign_byte`, bloco4 = `assign_char`.

use mutirao_predict::analyse::analyse;
use mutirao_predict::analytic::Policy;

const BLOCKS: &str = "
fn bloco1() { let b: i64 = 1; }
fn bloco2() { let b: i16 = 2; }
fn bloco3() { let b: i8 = 3; }
fn bloco4() { let b: char = 'x'; }
";

/// The analysis of `f` in `src` + the blocks, as trimmed lines without the `;`.
fn ops(src: &str, f: &str, args: &[(&str, f64)]) -> Vec<String> {
    let args: Vec<(String, f64)> = args.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    let a = analyse(&format!("{src}{BLOCKS}"), f, &args).unwrap_or_else(|e| panic!("{e}"));
    a.to_pamela()
        .lines()
        .map(|l| l.trim().trim_end_matches(';').to_string())
        .collect()
}

#[test]
fn item4_fig_4_17_straight_line() {
    let src = "fn fig417() { let w: f64 = 10000.0; let x: i32 = 10; let y: i32 = 20; let z: i32 = x + y; }";
    assert_eq!(
        ops(src, "fig417", &[]),
        [
            "assign_double",
            "assign_int",
            "assign_int",
            "access",
            "access",
            "sum_int",
            "assign_int"
        ]
    );
}

#[test]
fn item4_fig_4_18_for_loop() {
    // for (int i=0; i<50000; i++) { bloco1; }
    let src = "fn fig418() { for i in 0..50000 { bloco1(); } }";
    assert_eq!(
        ops(src, "fig418", &[]),
        [
            "assign_int",
            "access",
            "compare",
            "seq(i=1,50000){",
            "assign_long", // custo_bloco1
            "access",
            "sum_int",
            "assign_int",
            "access",
            "compare",
            "}"
        ]
    );
}

#[test]
fn item4_fig_4_19_nested_if_else() {
    let src = "fn fig419(x: i32) {
        if x > 10 {
            bloco1();
        } else {
            if x > 20 { bloco2(); } else { bloco3(); }
            bloco4();
        }
    }";
    assert_eq!(
        ops(src, "fig419", &[]),
        [
            "access",
            "compare",
            "if{",
            "assign_long",
            "}else{",
            "access",
            "compare",
            "if{",
            "assign_short",
            "}else{",
            "assign_byte",
            "}",
            "assign_char",
            "}"
        ]
    );
}

#[test]
fn item4_fig_4_20_call_with_constant_argument() {
    // double y=1000; if(condicao){ metodo_M(y); } else { bloco1; }
    // void metodo_M(double y){ double i; for(i=0; i<y; i++){ bloco2; } }
    let src = "
    fn fig420(condicao: bool) {
        let y: f64 = 1000.0;
        if condicao { metodo_m(y); } else { bloco1(); }
    }
    fn metodo_m(y: f64) {
        let mut i: f64;
        i = 0.0;
        while i < y { bloco2(); i += 1.0; }
    }";
    assert_eq!(
        ops(src, "fig420", &[]),
        [
            "assign_double", // y = 1000
            "access",        // custo_condicao
            "if{",
            "access",        // the argument y, then metodo_M inlined with y = 1000:
            "assign_double", // i = 0
            "access",
            "access",
            "compare",        // i < y once
            "seq(i=1,1000){", // the trip count comes from the argument
            "assign_short",   // custo_bloco2
            "access",
            "sum_double",
            "assign_double", // i += 1
            "access",
            "access",
            "compare",
            "}",
            "}else{",
            "assign_long",
            "}"
        ]
    );
    // The same function with another argument value, through a constant, gets another count.
    let src2 =
        src.replace("let y: f64 = 1000.0;", "let y: f64 = N as f64 * 2.0;") + "const N: i32 = 250;";
    let a = analyse(&format!("{src2}{BLOCKS}"), "fig420", &[]).unwrap();
    assert!(a.to_pamela().contains("seq(i=1,500){"), "{}", a.to_pamela());
}

#[test]
fn item4_analysis_prints_a_model_the_compiler_accepts() {
    use mutirao_predict::{analytic, pamela};
    let src =
        "fn work(n: usize) { let mut s: f64 = 0.0; for i in 0..n { if i % 2 == 0 { s += 1.5; } } }";
    let a = analyse(src, "work", &[("n".into(), 1000.0)]).unwrap();
    let model = format!(
        "COORD=0;\nL={{ par(p=1,P){{ par(i=1,10*W[p]){{ use(p,task[1,i](p)); }} }} }}\ntask[1,n](p)=Work(p,n);\n{}",
        a.task_def("Work")
    );
    let c = analytic::compile(&pamela::parse(&model).unwrap()).unwrap();
    let text = c.task_text("Work", Some(Policy::Worst)).unwrap();
    assert!(text.contains("1000*("), "{text}");
    // Counts per policy: the `if` body (access, sum_double, assign_double) runs 1000× under
    // Worst, never under Best, 500× under Mean.
    let w = a.counts(Policy::Worst).unwrap();
    let b = a.counts(Policy::Best).unwrap();
    let m = a.counts(Policy::Mean).unwrap();
    assert_eq!(w["sum_double"], 1000.0);
    assert!(!b.contains_key("sum_double"));
    assert_eq!(m["sum_double"], 500.0);
    assert_eq!(w["mod_long"], 1000.0);
    assert_eq!(w["compare"], 2.0 * 1000.0 + 1.0);
    let q = a
        .counts(Policy::Probability {
            default_q: Some(0.25),
        })
        .unwrap();
    assert_eq!(q["sum_double"], 250.0);
}

#[test]
fn item4_unsupported_constructs_are_errors_with_line_and_column() {
    let cases: [(&str, &str, &str); 7] = [
        (
            "fn f() {\n    loop { }\n}",
            "line 2, column 5: `loop`",
            "loop",
        ),
        (
            "fn f(n: i32) {\n  for i in 0..n { }\n}",
            "line 2, column 15: the loop's end is not a constant",
            "non-constant bound",
        ),
        (
            "fn f() {\n  let v = g(1);\n}",
            "line 2, column 11: call of `g`",
            "unknown function",
        ),
        (
            "fn f(x: i32) -> i32 {\n  if x > 0 { return 1; }\n  0\n}",
            "line 2, column 14: early `return`",
            "early return",
        ),
        (
            "fn f() { f(); }",
            "line 1, column 10: `f` is recursive",
            "recursion",
        ),
        (
            "fn f() {\n let mut i = 0;\n while i < 10 { i += 1; i += 1; }\n}",
            "line 3, column 2: `i` is changed more than once",
            "while shape",
        ),
        ("fn f( {", "line 1, column", "syntax error"),
    ];
    for (src, want, what) in cases {
        let e = analyse(src, "f", &[]).unwrap_err().to_string();
        assert!(e.starts_with(want), "{what}: {e}");
    }
    assert!(analyse("fn g() {}", "f", &[])
        .unwrap_err()
        .to_string()
        .contains("no function `f`"));
    assert!(analyse("fn f(n: i32) {}", "f", &[("m".into(), 1.0)])
        .unwrap_err()
        .to_string()
        .contains("no parameter `m`"));
}
