// helpers shared by the report pages' scripts (included inline: the pages stay self-contained)
const ANY = "";
const F = id => document.getElementById(id);
function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}
function fill(select, values, anyLabel) {
  select.replaceChildren(el("option", anyLabel, {value: ANY}));
  for (const v of values) select.append(el("option", v, {value: v}));
}
const uniq = values => [...new Set(values)].sort((a, b) => String(a).localeCompare(String(b), undefined, {numeric: true}));
